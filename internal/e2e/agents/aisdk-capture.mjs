import { generateText, streamText, tool, jsonSchema } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';
const base = process.env.BASE;
const model = process.env.MODEL || 'tiny-oa';
const openai = createOpenAI({ baseURL: base + '/v1', apiKey: 'iop-demo-key' });
const anthropic = createAnthropic({ baseURL: base + '/v1', apiKey: 'iop-demo-key' });
const tools = { weather: tool({ description: 'Get the weather for a city', inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }), execute: async ({ city }) => ({ city, forecast: 'sunny' }) }) };
const run = async (name, m) => {
  try {
    const r = await generateText({ model: m, prompt: 'Say hello.', tools, maxOutputTokens: 200, temperature: 0.2 });
    console.log(name, 'generate:', JSON.stringify(r.text));
    const s = streamText({ model: m, system: 'Be brief.', messages: [{ role: 'user', content: 'Say hello.' }] });
    let t = ''; for await (const d of s.textStream) t += d;
    console.log(name, 'stream:', JSON.stringify(t));
  } catch (e) { console.log(name, 'error:', e.message); }
};
await run('chat', openai.chat(model));
await run('responses', openai.responses(model));
await run('messages', anthropic(model));
